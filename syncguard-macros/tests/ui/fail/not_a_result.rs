use syncguard::locked;

#[locked(key = "job")]
async fn count() -> u32 {
    1
}

fn main() {}
