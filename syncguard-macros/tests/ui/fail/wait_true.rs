use syncguard::{LockError, locked};

#[locked(key = "job", wait = true)]
async fn forever() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
