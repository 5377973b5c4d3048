//! Parsing and checking the arguments of `#[locked(...)]`.

use std::time::Duration;

use proc_macro2::Span;
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitBool, LitInt, LitStr, Path, Token};

/// The names `#[locked]` accepts, for error messages.
const KNOWN: &str = "key, ttl, backend, wait, retries, retry_delay, backoff, jitter, wake_on_release, skip_if_held, heartbeat, max_hold, min_hold, on_lost, show_key, guard, crate";

/// A duration written as text, checked at compile time.
pub(crate) struct DurationArg {
    pub(crate) value: Duration,
    pub(crate) span: Span,
}

/// `wait = "5s"` or `wait = false`.
pub(crate) enum Wait {
    For(DurationArg),
    Once(Span),
}

impl Wait {
    fn span(&self) -> Span {
        match self {
            Self::For(wait) => wait.span,
            Self::Once(span) => *span,
        }
    }
}

/// An identifier argument restricted to a few choices (`on_lost = cancel`).
pub(crate) struct Choice {
    pub(crate) value: String,
    pub(crate) span: Span,
}

#[derive(Default)]
pub(crate) struct Args {
    pub(crate) krate: Option<Path>,
    pub(crate) key: Option<LitStr>,
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) backend: Option<Expr>,
    pub(crate) wait: Option<Wait>,
    pub(crate) retries: Option<(u32, Span)>,
    pub(crate) retry_delay: Option<DurationArg>,
    pub(crate) backoff: Option<Choice>,
    pub(crate) jitter: Option<Choice>,
    pub(crate) wake_on_release: Option<LitBool>,
    pub(crate) heartbeat: Option<LitBool>,
    pub(crate) max_hold: Option<DurationArg>,
    pub(crate) min_hold: Option<DurationArg>,
    pub(crate) skip_if_held: Option<LitBool>,
    pub(crate) on_lost: Option<Choice>,
    pub(crate) show_key: Option<LitBool>,
    pub(crate) guard: Option<Ident>,
}

impl Args {
    /// Whether a held lock skips the run (`skip_if_held = true`).
    pub(crate) fn skips_if_held(&self) -> bool {
        self.skip_if_held.as_ref().is_some_and(|flag| flag.value)
    }
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Self::default();
        // `#[locked("job:{id}")]`, as `#[instrument]` users write: the key may come first,
        // unnamed.
        if input.peek(LitStr) {
            args.key = Some(input.parse()?);
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        while !input.is_empty() {
            if input.peek(LitStr) {
                let text: LitStr = input.parse()?;
                return Err(syn::Error::new(
                    text.span(),
                    "only the key may be given without a name, and only first: write `key = \"...\"`, or move it to the front",
                ));
            }
            let name = Ident::parse_any(input).map_err(|error| {
                syn::Error::new(
                    error.span(),
                    "expected an argument `name = value` (or the key first, as text); see `#[locked]`'s documentation for the arguments",
                )
            })?;
            let label = name.to_string();
            input.parse::<Token![=]>().map_err(|_| {
                syn::Error::new(
                    name.span(),
                    format!("write `{label} = ...`: `#[locked]` takes `name = value` arguments"),
                )
            })?;
            match label.as_str() {
                "key" => set(&mut args.key, &name, input.parse()?)?,
                "ttl" => set(&mut args.ttl, &name, duration(input, "ttl")?)?,
                "backend" => set(&mut args.backend, &name, input.parse()?)?,
                "wait" => {
                    quoted_flag(input, "wait", "`wait = false` for a single attempt")?;
                    let wait = if input.peek(LitBool) {
                        let flag: LitBool = input.parse()?;
                        if flag.value {
                            return Err(syn::Error::new(
                                flag.span(),
                                "write how long to wait, e.g. `wait = \"5s\"`, or `wait = false` for a single attempt",
                            ));
                        }
                        Wait::Once(flag.span())
                    } else {
                        Wait::For(duration(input, "wait")?)
                    };
                    set(&mut args.wait, &name, wait)?;
                }
                "retries" => {
                    let count: LitInt = input.parse()?;
                    let value = count.base10_parse::<u32>().map_err(|_| {
                        syn::Error::new(
                            count.span(),
                            "`retries` must be a whole number from 0 to 4294967295",
                        )
                    })?;
                    set(&mut args.retries, &name, (value, count.span()))?;
                }
                "retry_delay" => set(
                    &mut args.retry_delay,
                    &name,
                    duration(input, "retry_delay")?,
                )?,
                "backoff" => set(
                    &mut args.backoff,
                    &name,
                    choice(input, "backoff", &["exponential", "fixed"])?,
                )?,
                "jitter" => set(
                    &mut args.jitter,
                    &name,
                    choice(input, "jitter", &["equal", "full", "none"])?,
                )?,
                "wake_on_release" => {
                    quoted_flag(
                        input,
                        "wake_on_release",
                        "`wake_on_release = false` or `wake_on_release = true`",
                    )?;
                    set(&mut args.wake_on_release, &name, input.parse()?)?;
                }
                "heartbeat" => {
                    quoted_flag(
                        input,
                        "heartbeat",
                        "`heartbeat = false` or `heartbeat = true`",
                    )?;
                    set(&mut args.heartbeat, &name, input.parse()?)?;
                }
                "max_hold" => set(&mut args.max_hold, &name, duration(input, "max_hold")?)?,
                "min_hold" => set(&mut args.min_hold, &name, duration(input, "min_hold")?)?,
                "skip_if_held" => {
                    quoted_flag(input, "skip_if_held", "`skip_if_held = true`")?;
                    set(&mut args.skip_if_held, &name, input.parse()?)?;
                }
                "on_lost" => set(
                    &mut args.on_lost,
                    &name,
                    choice(input, "on_lost", &["cancel", "notify"])?,
                )?,
                "show_key" => {
                    quoted_flag(input, "show_key", "`show_key = true`")?;
                    set(&mut args.show_key, &name, input.parse()?)?;
                }
                "guard" => set(&mut args.guard, &name, input.parse()?)?,
                "crate" => set(&mut args.krate, &name, Path::parse_mod_style(input)?)?,
                _ => {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("unknown argument `{label}`; `#[locked]` accepts: {KNOWN}"),
                    ));
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// Catches a flag written as text (`wait = "false"`), a common slip since durations are text,
/// and says how to write it.
fn quoted_flag(input: ParseStream<'_>, what: &str, write: &str) -> syn::Result<()> {
    let fork = input.fork();
    let Ok(text) = fork.parse::<LitStr>() else {
        return Ok(());
    };
    if matches!(text.value().trim(), "true" | "false") {
        return Err(syn::Error::new(
            text.span(),
            format!(
                "`{what} = {:?}` is text; write the flag without quotes: {write}",
                text.value()
            ),
        ));
    }
    Ok(())
}

fn set<T>(slot: &mut Option<T>, name: &Ident, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            name.span(),
            format!("`{name}` is given twice; give it once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn duration(input: ParseStream<'_>, what: &str) -> syn::Result<DurationArg> {
    let text: LitStr = input.parse().map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("`{what}` takes a duration as text, e.g. `{what} = \"30s\"`"),
        )
    })?;
    let value = humantime::parse_duration(&text.value()).map_err(|error| {
        syn::Error::new(
            text.span(),
            format!(
                "`{what}`: invalid duration {:?} ({error}); write numbers with units, e.g. \"500ms\", \"30s\", \"5m\", \"1h 30m\"; units: ns, us, ms, s (sec), m (min), h (hr), d (day), w (week)",
                text.value()
            ),
        )
    })?;
    Ok(DurationArg {
        value,
        span: text.span(),
    })
}

fn choice(input: ParseStream<'_>, what: &str, choices: &[&str]) -> syn::Result<Choice> {
    let ident = Ident::parse_any(input)?;
    let value = ident.to_string();
    if !choices.contains(&value.as_str()) {
        return Err(syn::Error::new(
            ident.span(),
            format!(
                "`{what} = {value}` is not known; choose one of: {}",
                choices.join(", ")
            ),
        ));
    }
    Ok(Choice {
        value,
        span: ident.span(),
    })
}

/// The longest ttl the runtime accepts (365 days), checked here so the error is at compile time.
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

impl Args {
    /// Checks combinations that parse but make no sense.
    pub(crate) fn check(&self) -> syn::Result<()> {
        if let Some(ttl) = &self.ttl
            && (ttl.value < Duration::from_millis(1) || ttl.value > MAX_TTL)
        {
            return Err(syn::Error::new(
                ttl.span,
                "`ttl` must be between 1ms and 365 days",
            ));
        }
        if let Some(max_hold) = &self.max_hold {
            if max_hold.value < Duration::from_millis(1) {
                return Err(syn::Error::new(
                    max_hold.span,
                    "`max_hold` must be at least 1ms",
                ));
            }
            if self.heartbeat.as_ref().is_some_and(|h| !h.value) {
                return Err(syn::Error::new(
                    max_hold.span,
                    "`max_hold` caps the heartbeat; it has no effect with `heartbeat = false`",
                ));
            }
        }
        if let Some(min_hold) = &self.min_hold
            && (min_hold.value < Duration::from_millis(1)
                || min_hold.value > Duration::from_secs(365 * 24 * 60 * 60))
        {
            return Err(syn::Error::new(
                min_hold.span,
                "`min_hold` must be between 1ms and 365 days",
            ));
        }
        if self.skips_if_held() {
            let waiting = [
                self.wait.as_ref().map(|wait| ("wait", wait.span())),
                self.retries.as_ref().map(|(_, span)| ("retries", *span)),
                self.retry_delay.as_ref().map(|d| ("retry_delay", d.span)),
                self.backoff.as_ref().map(|c| ("backoff", c.span)),
                self.jitter.as_ref().map(|c| ("jitter", c.span)),
                self.wake_on_release
                    .as_ref()
                    .map(|flag| ("wake_on_release", flag.span())),
            ];
            if let Some((name, span)) = waiting.into_iter().flatten().next() {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "`{name}` has no effect with `skip_if_held = true` (a single attempt; a held lock skips the run)"
                    ),
                ));
            }
        }
        if let Some(Wait::For(wait)) = &self.wait
            && wait.value.is_zero()
        {
            return Err(syn::Error::new(
                wait.span,
                "a zero wait is a single attempt: write `wait = false`",
            ));
        }
        if let Some(Wait::Once(_)) = &self.wait {
            let retry_settings = [
                self.retries.as_ref().map(|(_, span)| ("retries", *span)),
                self.retry_delay.as_ref().map(|d| ("retry_delay", d.span)),
                self.backoff.as_ref().map(|c| ("backoff", c.span)),
                self.jitter.as_ref().map(|c| ("jitter", c.span)),
                self.wake_on_release
                    .as_ref()
                    .map(|flag| ("wake_on_release", flag.span())),
            ];
            if let Some((name, span)) = retry_settings.into_iter().flatten().next() {
                return Err(syn::Error::new(
                    span,
                    format!("`{name}` has no effect with `wait = false` (a single attempt)"),
                ));
            }
        }
        Ok(())
    }
}
