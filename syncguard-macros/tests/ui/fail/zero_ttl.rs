use syncguard::{LockError, locked};

#[locked(key = "job", ttl = "0s")]
async fn instant() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
