use syncguard::{LockError, locked};

#[locked(key = "job:{id}", guard = id)]
async fn run(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
