use syncguard::{LockError, locked};

#[locked(key = "job:{id}", guard = id)]
async fn run(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// Names bound by a destructuring parameter count too.
#[locked(key = "job:{id}", guard = name)]
async fn named((id, name): (u64, String)) -> Result<String, LockError> {
    Ok(format!("{id} {name}"))
}

// The suggestion is a name the function does not use already.
#[locked(key = "job:{id}", guard = lock)]
async fn lock(id: u64, lock: bool) -> Result<bool, LockError> {
    Ok(id > 0 && lock)
}

fn main() {}
