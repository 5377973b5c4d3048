use syncguard::{LockError, locked};

struct Opaque;

#[locked(key = "job:{value}")]
async fn opaque(value: Opaque) -> Result<(), LockError> {
    let _ = value;
    Ok(())
}

fn main() {}
