//! What the layer's test binaries share: a `tracing` recorder that keeps what the layer logs.
// Each test binary uses part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{self, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// The fields of an event or a span, as text.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fields(HashMap<&'static str, String>);

impl Fields {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

/// An event, with the spans it happened in (innermost first).
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) level: Level,
    pub(crate) fields: Fields,
    pub(crate) spans: Vec<(String, Fields)>,
}

impl Recorded {
    pub(crate) fn message(&self) -> &str {
        self.fields.get("message").unwrap_or_default()
    }
}

/// A `tracing` layer that keeps every event, and the latest fields of every span.
#[derive(Clone, Default)]
pub(crate) struct Recorder {
    pub(crate) events: Arc<Mutex<Vec<Recorded>>>,
    /// Each span's fields after every change: `(name, fields)`.
    span_states: Arc<Mutex<Vec<(String, Fields)>>>,
}

impl Recorder {
    /// Installs the recorder as this thread's subscriber (the tests run on a current-thread
    /// runtime, so the layer, the handler and the guard all run here).
    pub(crate) fn install(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    pub(crate) fn events(&self) -> Vec<Recorded> {
        self.events.lock().unwrap().clone()
    }

    pub(crate) fn event(&self, message: &str) -> Recorded {
        let events = self.events();
        let found = events.iter().find(|event| event.message() == message);
        found
            .unwrap_or_else(|| panic!("no event {message:?} in {events:#?}"))
            .clone()
    }

    /// The warnings the layer itself logged.
    pub(crate) fn layer_warnings(&self) -> Vec<Recorded> {
        self.events()
            .into_iter()
            .filter(|event| {
                event.level == Level::WARN && event.message().starts_with("syncguard_tower")
            })
            .collect()
    }

    pub(crate) fn span_states(&self) -> Vec<(String, Fields)> {
        self.span_states.lock().unwrap().clone()
    }
}

impl<S> Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: layer::Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let span = ctx.span(id).expect("a new span");
        self.span_states
            .lock()
            .unwrap()
            .push((span.name().to_owned(), fields.clone()));
        span.extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: layer::Context<'_, S>) {
        let span = ctx.span(id).expect("a live span");
        let mut extensions = span.extensions_mut();
        let fields = extensions.get_mut::<Fields>().expect("recorded when made");
        values.record(fields);
        self.span_states
            .lock()
            .unwrap()
            .push((span.name().to_owned(), fields.clone()));
    }

    fn on_event(&self, event: &Event<'_>, ctx: layer::Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .map(|span| {
                        let fields = span.extensions().get::<Fields>().cloned();
                        (span.name().to_owned(), fields.unwrap_or_default())
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.events.lock().unwrap().push(Recorded {
            level: *event.metadata().level(),
            fields,
            spans,
        });
    }
}
