use syncguard::{LockError, locked};

#[locked(key = "job", max_hold = 600)]
async fn number() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
