use syncguard::{LockError, locked};

#[locked(key = "job", tll = "30s")]
async fn typo() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
