use syncguard::{LockError, locked};

#[locked(key = "job", skip_if_held = true, wait = "5s")]
async fn confused() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
