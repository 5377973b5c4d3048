//! OTLP export of syncguard's OpenTelemetry spans and metrics (feature `opentelemetry`).
//!
//! With the feature, the server wraps its backend in
//! [`with_opentelemetry`](syncguard::telemetry::with_opentelemetry), which records a span per
//! backend call (`syncguard.acquire`, `syncguard.release`, `syncguard.extend`,
//! `syncguard.is_locked`, `syncguard.lookup`) and the `syncguard.*` metrics with the *global*
//! tracer and meter providers. [`install`] sets those providers up from the standard `OTEL_*`
//! variables, with OTLP exporters over HTTP/protobuf; the binary calls it before it opens the
//! backend, and calls [`OtelGuard::shutdown`] after the graceful shutdown, so that the spans
//! of the last requests are exported too.
//!
//! | variable | |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | the collector's base URL (`http://collector:4318`); `/v1/traces` and `/v1/metrics` are appended |
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` | one signal's full URL, used as given |
//! | `OTEL_TRACES_EXPORTER`, `OTEL_METRICS_EXPORTER` | `otlp` or `none` |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL` (and per signal) | `http/protobuf`, the only one supported |
//! | `OTEL_EXPORTER_OTLP_TIMEOUT` (and per signal) | milliseconds per export, default 10000 |
//! | `OTEL_SERVICE_NAME` | default `syncguard-server` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) |
//! | `OTEL_SDK_DISABLED` | `true` exports nothing |
//!
//! A signal is exported when its `*_EXPORTER` variable is `otlp`, or when it is unset and an
//! endpoint (the common one or the signal's) is set; `none` turns it off. With no variable
//! set, nothing is installed and no connection is made. (The OpenTelemetry specification
//! makes `otlp` to `localhost:4318` the default; a lock server that starts sending data
//! nobody asked for is the worse surprise.) The exporters themselves also read
//! `OTEL_EXPORTER_OTLP_HEADERS` (and per signal), `OTEL_RESOURCE_ATTRIBUTES`, the batch
//! settings `OTEL_BSP_*` and `OTEL_METRIC_EXPORT_INTERVAL` (default 60000 ms). Compression is
//! not built in.
//!
//! HTTPS endpoints are checked against the Mozilla root certificates (webpki-roots) with
//! rustls on *ring*, as the JWKS fetches are.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318
//! let telemetry = syncguard_server::otel::install()?;
//! // ... serve until SIGTERM ...
//! telemetry.shutdown().await; // exports what is still buffered
//! # Ok(()) }
//! ```

use opentelemetry::{Key, global};
use opentelemetry_otlp::{
    ExporterBuildError, MetricExporter, Protocol, SpanExporter, WithExportConfig, WithHttpConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::resource::{EnvResourceDetector, TelemetryResourceDetector};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tokio::runtime::Handle;

mod http_client;
mod settings;

use http_client::{RuntimeHttpClient, https_connector};
use settings::{Settings, Shown};

/// `service.name` unless the environment names another.
const DEFAULT_SERVICE_NAME: &str = "syncguard-server";

/// Why the `OTEL_*` variables cannot be used; the server does not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtelError {
    /// A variable holds a value this server does not accept.
    #[error("{variable}={value:?}: {reason}")]
    Invalid {
        /// The variable's name.
        variable: &'static str,
        /// Its value, with any credentials in a URL hidden.
        value: String,
        /// What is wrong, and what is accepted.
        reason: String,
    },

    /// An OTLP exporter could not be built.
    #[error("could not set up the OTLP {signal} exporter: {source}")]
    Exporter {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// What went wrong.
        #[source]
        source: ExporterBuildError,
    },

    /// TLS for HTTPS endpoints could not be set up.
    #[error("could not set up TLS for the OTLP exporters: {0}")]
    Tls(#[source] rustls::Error),

    /// [`install`] was called outside a Tokio runtime, which sends the exports.
    #[error("OpenTelemetry export needs a Tokio runtime: call otel::install from within one")]
    NoRuntime,
}

/// The providers [`install`] set up. Call [`shutdown`](Self::shutdown) when the server has
/// stopped: the spans and metrics still buffered are exported then.
#[must_use = "without `shutdown`, the spans and metrics not yet exported are lost"]
#[derive(Debug, Default)]
pub struct OtelGuard {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
}

impl OtelGuard {
    /// Exports the spans and metrics still buffered (the metrics are collected once more),
    /// then stops the exporters. Failures are logged; each provider waits at most about 5 s.
    pub async fn shutdown(self) {
        let Self {
            tracer_provider,
            meter_provider,
        } = self;
        if tracer_provider.is_none() && meter_provider.is_none() {
            return;
        }
        // The SDK's shutdown blocks until its export thread is done, and that export sends
        // its request on this runtime: block a thread of its own, never a worker.
        let shutdown = tokio::task::spawn_blocking(move || {
            let traces = tracer_provider.map(|provider| provider.shutdown());
            let metrics = meter_provider.map(|provider| provider.shutdown());
            (traces, metrics)
        });
        match shutdown.await {
            Ok((traces, metrics)) => {
                if let Some(Err(error)) = traces {
                    tracing::warn!(%error, "OpenTelemetry: the last spans may not have been exported");
                }
                if let Some(Err(error)) = metrics {
                    tracing::warn!(%error, "OpenTelemetry: the last metrics may not have been exported");
                }
            }
            Err(error) => tracing::warn!(%error, "OpenTelemetry: the exporters' shutdown failed"),
        }
    }
}

/// Installs the global tracer and meter providers that the `OTEL_*` variables ask for (see
/// the [module docs](self)), and logs one line saying what is exported where. With nothing
/// asked for, installs nothing and returns an idle guard.
///
/// Call it from within the Tokio runtime that serves, before the backend is wrapped (the
/// decorator takes its tracer and meter from the global providers when it is created).
///
/// # Errors
/// [`OtelError::Invalid`] naming the variable whose value cannot be used; the others when an
/// exporter cannot be built.
pub fn install() -> Result<OtelGuard, OtelError> {
    let settings = Settings::read(|name| std::env::var(name).ok())?;
    if settings.traces.is_none() && settings.metrics.is_none() {
        tracing::info!(
            "OpenTelemetry export off (no OTLP endpoint or exporter set, or both exporters `none`)"
        );
        return Ok(OtelGuard::default());
    }
    let runtime = Handle::try_current().map_err(|_| OtelError::NoRuntime)?;
    let connector = https_connector().map_err(OtelError::Tls)?;
    let client = |timeout| RuntimeHttpClient::new(&connector, &runtime, timeout);
    let resource = resource(settings.service_name.as_deref());

    let tracer_provider = match &settings.traces {
        Some(destination) => {
            let exporter = SpanExporter::builder()
                .with_http()
                .with_http_client(client(destination.timeout))
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(destination.url.to_string())
                .with_timeout(destination.timeout)
                .build()
                .map_err(|source| OtelError::Exporter {
                    signal: "traces",
                    source,
                })?;
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource.clone())
                    .build(),
            )
        }
        None => None,
    };
    let meter_provider = match &settings.metrics {
        Some(destination) => {
            let exporter = MetricExporter::builder()
                .with_http()
                .with_http_client(client(destination.timeout))
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(destination.url.to_string())
                .with_timeout(destination.timeout)
                .build()
                .map_err(|source| OtelError::Exporter {
                    signal: "metrics",
                    source,
                })?;
            Some(
                SdkMeterProvider::builder()
                    .with_periodic_exporter(exporter)
                    .with_resource(resource.clone())
                    .build(),
            )
        }
        None => None,
    };

    if let Some(provider) = &tracer_provider {
        global::set_tracer_provider(provider.clone());
    }
    if let Some(provider) = &meter_provider {
        global::set_meter_provider(provider.clone());
    }
    let service = resource
        .get(&Key::from_static_str("service.name"))
        .map(|name| name.to_string())
        .unwrap_or_default();
    tracing::info!(
        service = %service,
        traces = %Shown(settings.traces.as_ref()),
        metrics = %Shown(settings.metrics.as_ref()),
        "OpenTelemetry export over OTLP/HTTP"
    );
    Ok(OtelGuard {
        tracer_provider,
        meter_provider,
    })
}

/// The resource of every span and metric: our default service name, under
/// `OTEL_RESOURCE_ATTRIBUTES`, under `OTEL_SERVICE_NAME` (the specification's precedence).
fn resource(service_name: Option<&str>) -> Resource {
    // Not `Resource::builder()`: its first detector puts `unknown_service` where our default
    // belongs, and a later default would override the operator's `OTEL_RESOURCE_ATTRIBUTES`.
    let builder = Resource::builder_empty()
        .with_service_name(DEFAULT_SERVICE_NAME)
        .with_detectors(&[
            Box::new(TelemetryResourceDetector),
            Box::new(EnvResourceDetector::new()),
        ]);
    match service_name {
        Some(name) => builder.with_service_name(name.to_owned()).build(),
        None => builder.build(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_name_defaults_to_the_server() {
        let name = |resource: Resource| {
            resource
                .get(&Key::from_static_str("service.name"))
                .map(|name| name.to_string())
        };
        // The detector reads the test process's own environment.
        assert!(
            std::env::var_os("OTEL_RESOURCE_ATTRIBUTES").is_none(),
            "run the unit tests without OTEL_RESOURCE_ATTRIBUTES"
        );
        assert_eq!(name(resource(None)).as_deref(), Some("syncguard-server"));
        assert_eq!(
            name(resource(Some("locks-eu"))).as_deref(),
            Some("locks-eu")
        );
    }
}
