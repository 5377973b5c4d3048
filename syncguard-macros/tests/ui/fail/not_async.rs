use syncguard::{LockError, locked};

#[locked(key = "job")]
fn not_async() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
