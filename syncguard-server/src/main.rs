//! `syncguard-server`: LockServiceCentral's REST lock API on syncguard's backends. See the
//! crate documentation (`cargo doc -p syncguard-server --open`) or `--help`.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use syncguard_server::ServerConfig;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let config = ServerConfig::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    if config.log_json {
        subscriber.json().init();
    } else {
        subscriber.init();
    }
    match syncguard_server::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error}");
            eprintln!("syncguard-server: {error}");
            ExitCode::FAILURE
        }
    }
}
