//! What the `OTEL_*` variables ask for, checked before anything is installed.

/// The specification's OTLP/HTTP endpoint, when a signal is turned on without one.
const DEFAULT_ENDPOINT: &str = "http://localhost:4318";
/// The specification's default export timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

use std::fmt;
use std::time::Duration;

use http::uri::{Scheme, Uri};

use super::OtelError;

/// One signal's export: where, and how long one export may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Destination {
    pub(super) url: Uri,
    pub(super) timeout: Duration,
}

/// A destination in the log line, or `off`.
pub(super) struct Shown<'a>(pub(super) Option<&'a Destination>);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(destination) => destination.url.fmt(f),
            None => f.write_str("off"),
        }
    }
}

/// A signal's variables.
pub(super) struct Signal {
    name: &'static str,
    exporter: &'static str,
    endpoint: &'static str,
    path: &'static str,
    protocol: &'static str,
    timeout: &'static str,
}

const TRACES: Signal = Signal {
    name: "traces",
    exporter: "OTEL_TRACES_EXPORTER",
    endpoint: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    path: "/v1/traces",
    protocol: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    timeout: "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
};

const METRICS: Signal = Signal {
    name: "metrics",
    exporter: "OTEL_METRICS_EXPORTER",
    endpoint: "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    path: "/v1/metrics",
    protocol: "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    timeout: "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
};

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";

/// What the `OTEL_*` variables ask for.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Settings {
    pub(super) service_name: Option<String>,
    pub(super) traces: Option<Destination>,
    pub(super) metrics: Option<Destination>,
}

/// The variables, through `lookup` (the environment, or a test's map); blank counts as
/// unset, as the specification says.
struct Variables<F>(F);

impl<F: Fn(&str) -> Option<String>> Variables<F> {
    fn get(&self, name: &'static str) -> Option<(&'static str, String)> {
        (self.0)(name)
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
            .map(|value| (name, value))
    }
}

fn invalid(variable: &'static str, value: &str, reason: impl Into<String>) -> OtelError {
    OtelError::Invalid {
        variable,
        value: hide_credentials(value),
        reason: reason.into(),
    }
}

impl Settings {
    pub(super) fn read(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, OtelError> {
        let variables = Variables(lookup);
        let disabled = variables
            .get(SDK_DISABLED)
            .is_some_and(|(_, value)| value.eq_ignore_ascii_case("true"));
        if disabled {
            return Ok(Self {
                service_name: None,
                traces: None,
                metrics: None,
            });
        }
        Ok(Self {
            service_name: variables.get(SERVICE_NAME).map(|(_, name)| name),
            traces: destination(&variables, &TRACES)?,
            metrics: destination(&variables, &METRICS)?,
        })
    }
}

/// Where `signal` goes, if it is exported.
fn destination(
    variables: &Variables<impl Fn(&str) -> Option<String>>,
    signal: &Signal,
) -> Result<Option<Destination>, OtelError> {
    let own_endpoint = variables.get(signal.endpoint);
    let common_endpoint = variables.get(ENDPOINT);
    let on = match variables.get(signal.exporter) {
        Some((variable, value)) => match value.to_ascii_lowercase().as_str() {
            "otlp" => true,
            "none" => false,
            _ => {
                return Err(invalid(
                    variable,
                    &value,
                    "unknown exporter; this server exports `otlp` (OTLP over HTTP/protobuf) or `none`",
                ));
            }
        },
        None => own_endpoint.is_some() || common_endpoint.is_some(),
    };
    if !on {
        return Ok(None);
    }

    if let Some((variable, value)) = variables
        .get(signal.protocol)
        .or_else(|| variables.get(PROTOCOL))
        && value != "http/protobuf"
    {
        return Err(invalid(
            variable,
            &value,
            format!(
                "this server sends OTLP {} over `http/protobuf` only (grpc and http/json are not built in)",
                signal.name
            ),
        ));
    }

    // A signal's own endpoint is its full URL; the common one is a base the signal's path is
    // appended to (the specification's rule).
    let url = match (own_endpoint, common_endpoint) {
        (Some((variable, value)), _) => endpoint(variable, &value, None)?,
        (None, Some((variable, value))) => endpoint(variable, &value, Some(signal.path))?,
        (None, None) => endpoint(ENDPOINT, DEFAULT_ENDPOINT, Some(signal.path))?,
    };

    let timeout = match variables
        .get(signal.timeout)
        .or_else(|| variables.get(TIMEOUT))
    {
        Some((variable, value)) => match value.parse::<u64>() {
            Ok(millis) if millis > 0 => Duration::from_millis(millis),
            _ => {
                return Err(invalid(
                    variable,
                    &value,
                    "not a timeout: give a positive whole number of milliseconds",
                ));
            }
        },
        None => DEFAULT_TIMEOUT,
    };
    Ok(Some(Destination { url, timeout }))
}

/// An http:// or https:// URL, with `path` appended to a base URL.
fn endpoint(variable: &'static str, value: &str, path: Option<&str>) -> Result<Uri, OtelError> {
    let url = match path {
        Some(path) => format!("{}{path}", value.trim_end_matches('/')),
        None => value.to_owned(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|error| invalid(variable, value, format!("not a URL: {error}")))?;
    let scheme_ok = uri.scheme() == Some(&Scheme::HTTP) || uri.scheme() == Some(&Scheme::HTTPS);
    let Some(authority) = uri.authority().filter(|_| scheme_ok) else {
        return Err(invalid(
            variable,
            value,
            "not an http:// or https:// URL (such as http://collector:4318)",
        ));
    };
    if authority.as_str().contains('@') {
        return Err(invalid(
            variable,
            value,
            "credentials in the URL are not sent; put them in OTEL_EXPORTER_OTLP_HEADERS (authorization=...)",
        ));
    }
    Ok(uri)
}

/// `value` with whatever stands between `//` and `@` replaced, so that a password never
/// reaches an error message.
fn hide_credentials(value: &str) -> String {
    match (value.find("//"), value.rfind('@')) {
        (Some(start), Some(end)) if start + 2 <= end => {
            format!("{}***{}", &value[..start + 2], &value[end..])
        }
        _ => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(variables: &[(&str, &str)]) -> Result<Settings, OtelError> {
        let variables: HashMap<String, String> = variables
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        Settings::read(|name| variables.get(name).cloned())
    }

    fn url(destination: Option<Destination>) -> Option<String> {
        destination.map(|destination| destination.url.to_string())
    }

    fn rejected(variables: &[(&str, &str)]) -> String {
        read(variables).expect_err("an invalid setting").to_string()
    }

    #[test]
    fn nothing_set_exports_nothing() {
        let settings = read(&[]).unwrap();
        assert_eq!(settings.traces, None);
        assert_eq!(settings.metrics, None);
        // Settings of the exporters alone turn nothing on.
        let settings = read(&[
            ("OTEL_SERVICE_NAME", "locks"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_TRACES_EXPORTER", " "),
        ])
        .unwrap();
        assert_eq!(settings.traces, None);
        assert_eq!(settings.metrics, None);
    }

    #[test]
    fn the_common_endpoint_is_a_base() {
        let settings = read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]).unwrap();
        assert_eq!(
            url(settings.traces.clone()).as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(
            url(settings.metrics).as_deref(),
            Some("http://collector:4318/v1/metrics")
        );
        assert_eq!(settings.traces.unwrap().timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn a_signal_endpoint_is_used_as_given_and_turns_on_that_signal_only() {
        let settings = read(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://collector.example/otlp/spans",
        )])
        .unwrap();
        assert_eq!(
            url(settings.traces).as_deref(),
            Some("https://collector.example/otlp/spans")
        );
        assert_eq!(settings.metrics, None);
    }

    #[test]
    fn exporters_turn_signals_on_and_off() {
        let settings = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ])
        .unwrap();
        assert!(settings.traces.is_some());
        assert_eq!(settings.metrics, None);

        let settings = read(&[("OTEL_TRACES_EXPORTER", "OTLP")]).unwrap();
        assert_eq!(
            url(settings.traces).as_deref(),
            Some("http://localhost:4318/v1/traces"),
            "the specification's default endpoint"
        );
        assert_eq!(settings.metrics, None);

        let settings = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "bogus"),
        ])
        .unwrap();
        assert_eq!((settings.traces, settings.metrics), (None, None));
    }

    #[test]
    fn timeouts_and_protocols() {
        let settings = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "700"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ])
        .unwrap();
        assert_eq!(
            settings.traces.unwrap().timeout,
            Duration::from_millis(2500)
        );
        assert_eq!(
            settings.metrics.unwrap().timeout,
            Duration::from_millis(700)
        );
    }

    #[test]
    fn bad_values_name_their_variable() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        let message = rejected(&[endpoint, ("OTEL_TRACES_EXPORTER", "bogus")]);
        assert!(
            message.starts_with("OTEL_TRACES_EXPORTER=\"bogus\""),
            "{message}"
        );
        let message = rejected(&[("OTEL_METRICS_EXPORTER", "otlp,console")]);
        assert!(message.starts_with("OTEL_METRICS_EXPORTER="), "{message}");
        let message = rejected(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
        assert!(
            message.starts_with("OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\""),
            "{message}"
        );
        let message = rejected(&[endpoint, ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "10s")]);
        assert!(
            message.starts_with("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="),
            "{message}"
        );
        for bad in [
            "localhost:4318",
            "not a url",
            "ftp://collector",
            "/v1/traces",
        ] {
            let message = rejected(&[("OTEL_EXPORTER_OTLP_ENDPOINT", bad)]);
            assert!(
                message.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT="),
                "{message}"
            );
        }
        let message = rejected(&[(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "https://user:hunter2@collector/v1/metrics",
        )]);
        assert!(
            message.starts_with("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
    }
}
