use syncguard::{LockError, locked};

struct Settings {
    redis_url: String,
}

#[locked(key = "job", backend = settings.redis_url)]
async fn misconfigured(settings: &Settings) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
