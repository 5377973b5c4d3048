use syncguard::{LockError, locked};

// Only the key may be unnamed, and only first.
#[locked(ttl = "30s", "job:{id}")]
async fn late(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// An argument without a value.
#[locked("job:{id}", ttl)]
async fn bare(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// The key twice: unnamed and named.
#[locked("job:{id}", key = "job:{id}")]
async fn twice(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// Neither a name nor the key.
#[locked(42)]
async fn number(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
