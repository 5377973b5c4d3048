use syncguard::{LockError, locked};

#[locked(key = "job:{idd}")]
async fn run(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
