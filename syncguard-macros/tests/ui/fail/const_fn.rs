use syncguard::{LockError, locked};

#[locked(key = "job")]
const fn constant() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
