use syncguard::{LockError, locked};

#[locked(key = "job:{id")]
async fn run(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
