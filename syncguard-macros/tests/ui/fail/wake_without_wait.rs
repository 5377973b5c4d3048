use syncguard::{LockError, locked};

#[locked(key = "job", wait = false, wake_on_release = false)]
async fn confused() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
