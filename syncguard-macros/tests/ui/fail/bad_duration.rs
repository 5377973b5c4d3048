use syncguard::{LockError, locked};

#[locked(key = "job", ttl = "30 parsecs")]
async fn far() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
