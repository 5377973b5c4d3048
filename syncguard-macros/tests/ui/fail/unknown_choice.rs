use syncguard::{LockError, locked};

#[locked(key = "job", on_lost = explode)]
async fn boom() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
