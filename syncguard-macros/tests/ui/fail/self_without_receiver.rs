use syncguard::{LockError, locked};

#[locked(key = "job:{self.id}")]
async fn free() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
