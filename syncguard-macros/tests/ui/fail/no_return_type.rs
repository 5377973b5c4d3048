use syncguard::locked;

#[locked(key = "job")]
async fn nothing() {}

fn main() {}
