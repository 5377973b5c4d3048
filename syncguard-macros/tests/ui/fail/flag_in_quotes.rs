use syncguard::{LockError, locked};

#[locked(key = "job", wait = "false")]
async fn once() -> Result<(), LockError> {
    Ok(())
}

#[locked(key = "job", heartbeat = "false")]
async fn unkept() -> Result<(), LockError> {
    Ok(())
}

#[locked(key = "job", show_key = "true")]
async fn named() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
