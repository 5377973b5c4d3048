//! The body runs inside the hold's `syncguard.hold` span, which records the key's hash, the
//! fence and how the hold ended, and the key itself only with `show_key = true`.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use syncguard::{LockError, LockName, MemoryBackend, locked};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Span, Subscriber};
use tracing_subscriber::Registry;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

/// A span's name and its fields as recorded so far.
type SpanRecord = (&'static str, HashMap<String, String>);

/// Every span, by id.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<HashMap<u64, SpanRecord>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let name = attrs.metadata().name();
        self.0.lock().unwrap().insert(id.into_u64(), (name, fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some((_, fields)) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
}

impl Spans {
    fn fields(&self, id: &Id) -> SpanRecord {
        self.0.lock().unwrap()[&id.into_u64()].clone()
    }
}

#[locked(key = "traced:{n}", backend = backend, guard = lock)]
async fn traced(backend: &MemoryBackend, n: u32) -> Result<Id, LockError> {
    let current = Span::current();
    assert_eq!(
        current.id(),
        lock.span().id(),
        "the body runs in the hold's span"
    );
    Ok(current.id().expect("a span is entered"))
}

#[locked(key = "traced:{n}", backend = backend, show_key = true)]
async fn traced_with_key(backend: &MemoryBackend, n: u32) -> Result<Id, LockError> {
    Ok(Span::current().id().expect("a span is entered"))
}

#[tokio::test]
async fn the_body_runs_in_the_hold_span() {
    let spans = Spans::default();
    let _default = tracing::subscriber::set_default(Registry::default().with(spans.clone()));
    let backend = MemoryBackend::new();

    let id = traced(&backend, 1).await.unwrap();
    let (name, fields) = spans.fields(&id);
    assert_eq!(name, "syncguard.hold");
    let hash = LockName::new("traced:1", false).key_hash().to_owned();
    assert_eq!(fields.get("key_hash"), Some(&hash), "{fields:?}");
    assert_eq!(fields.get("key"), None, "the key stays hidden: {fields:?}");
    assert_eq!(
        fields.get("fence").map(String::as_str),
        Some("000000000000001")
    );
    assert_eq!(fields.get("outcome").map(String::as_str), Some("released"));

    let id = traced_with_key(&backend, 2).await.unwrap();
    let (name, fields) = spans.fields(&id);
    assert_eq!(name, "syncguard.hold");
    assert_eq!(
        fields.get("key").map(String::as_str),
        Some("traced:2"),
        "{fields:?}"
    );
    assert_eq!(fields.get("outcome").map(String::as_str), Some("released"));
}
