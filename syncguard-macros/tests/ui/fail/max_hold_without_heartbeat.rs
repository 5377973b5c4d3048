use syncguard::{LockError, locked};

#[locked(key = "job", heartbeat = false, max_hold = "10m")]
async fn capped() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
