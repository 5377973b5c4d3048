use syncguard::{LockError, locked};

#[locked(key = "job", min_hold = "0s")]
async fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
