use syncguard::{LockError, locked};

#[locked(key = "job", ttl = "30s", ttl = "10s")]
async fn twice() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
