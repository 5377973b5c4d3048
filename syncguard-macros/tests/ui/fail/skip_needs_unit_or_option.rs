use syncguard::{LockError, locked};

#[locked(key = "job", skip_if_held = true)]
async fn count() -> Result<u32, LockError> {
    Ok(1)
}

fn main() {}
