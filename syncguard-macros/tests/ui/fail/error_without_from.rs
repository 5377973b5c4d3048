use syncguard::locked;

#[locked(key = "job")]
async fn stringly() -> Result<(), String> {
    Ok(())
}

fn main() {}
