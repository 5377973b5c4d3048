use syncguard::{LockError, locked};

#[locked(key = "job", wait = false, retries = 3)]
async fn confused() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
