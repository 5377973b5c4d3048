//! `syncguard-server`: LockServiceCentral's REST lock API on syncguard's backends. See the
//! crate documentation (`cargo doc -p syncguard-server --open`) or `--help`.

use std::fmt::Display;
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use syncguard_server::ServerConfig;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let config = ServerConfig::parse();
    // The OpenTelemetry SDK announces at info what `otel::install` already says in one line;
    // its warnings (failed exports) stay.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,opentelemetry=warn"));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    if config.log_json {
        subscriber.json().init();
    } else {
        subscriber.init();
    }
    // Before `run` opens the backend: the decorator takes the global providers then.
    #[cfg(feature = "opentelemetry")]
    let telemetry = match syncguard_server::otel::install() {
        Ok(telemetry) => telemetry,
        Err(error) => return failure(error),
    };
    let served = syncguard_server::run(config).await;
    // After the graceful shutdown, so that the spans of the last requests are exported too.
    #[cfg(feature = "opentelemetry")]
    telemetry.shutdown().await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => failure(error),
    }
}

fn failure(error: impl Display) -> ExitCode {
    tracing::error!("{error}");
    eprintln!("syncguard-server: {error}");
    ExitCode::FAILURE
}
