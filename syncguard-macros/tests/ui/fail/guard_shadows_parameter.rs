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

fn main() {}
