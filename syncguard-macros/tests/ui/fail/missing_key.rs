use syncguard::{LockError, locked};

#[locked(ttl = "30s")]
async fn anonymous() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
