//! Code generation for `#[locked]`.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{FnArg, ItemFn, Pat, ReturnType, Type};

use crate::attr::{Args, DurationArg, Wait};
use crate::template::{self, Segment};

pub(crate) fn expand(args: Args, item: ItemFn) -> syn::Result<TokenStream> {
    args.check()?;
    check_signature(&item)?;
    check_guard_name(&args, &item)?;
    let krate = args
        .krate
        .clone()
        .map_or_else(|| quote!(::syncguard), |path| quote!(#path));
    let private = quote!(#krate::__private);

    let key = args.key.as_ref().ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `key`: name the lock, e.g. `#[locked(key = \"job:{id}\")]`",
        )
    })?;
    let key_expr = key_expression(key, &item)?;

    let ttl = args
        .ttl
        .as_ref()
        .map(|ttl| duration(&private, ttl))
        .map(|ttl| quote!(.with_ttl(#ttl)));
    let retry = retry_policy(&args, &private);
    let heartbeat = args.heartbeat.as_ref().map(|h| quote!(.with_heartbeat(#h)));
    let max_hold = args
        .max_hold
        .as_ref()
        .map(|d| duration(&private, d))
        .map(|d| quote!(.with_max_hold(#d)));
    let on_lost = match args.on_lost.as_ref().map(|c| (c.value.as_str(), c.span)) {
        Some(("notify", span)) => quote_spanned!(span=> #private::OnLost::Notify),
        _ => quote!(#private::OnLost::Cancel),
    };

    let (ret, ret_span) = match &item.sig.output {
        ReturnType::Type(_, ty) => (quote!(#ty), ty.span()),
        ReturnType::Default => (quote!(()), item.sig.ident.span()),
    };
    let nameable_ret = !mentions_impl_trait(&item.sig.output);
    let from_lock_error =
        quote_spanned!(ret_span=> <#ret as #private::LockedResult>::from_lock_error);

    let backend = match &args.backend {
        Some(expr) => quote_spanned! {expr.span()=> {
            use #private::SharedBackend as _;
            (#expr).shared_backend()
        }},
        None => quote! {
            match #private::default_backend() {
                ::core::result::Result::Ok(backend) => backend,
                ::core::result::Result::Err(error) => return #from_lock_error(error),
            }
        },
    };
    let guard_binding = args
        .guard
        .as_ref()
        .map(|name| quote!(let #name = &__syncguard_guard;));
    // Pins the body's type to the declared return type, so `?` and type errors resolve
    // against the user's signature (as `#[tracing::instrument]` does).
    let pin_return_type = nameable_ret.then(|| {
        quote_spanned! {ret_span=>
            #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::let_unit_value)]
            if false {
                let __syncguard_declared: #ret = loop {};
                return __syncguard_declared;
            }
        }
    });

    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = item;
    let stmts = &block.stmts;
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            let __syncguard_options = #private::LockOptions::new(#key_expr)
                #ttl
                .with_retry(#retry)
                #heartbeat
                #max_hold;
            let __syncguard_backend = #backend;
            let __syncguard_guard =
                match #private::acquire_shared(__syncguard_backend, &__syncguard_options).await {
                    ::core::result::Result::Ok(guard) => guard,
                    ::core::result::Result::Err(error) => return #from_lock_error(error),
                };
            let __syncguard_result = {
                #guard_binding
                let __syncguard_body = async move {
                    #pin_return_type
                    #(#stmts)*
                };
                match #private::run_guarded(&__syncguard_guard, #on_lost, __syncguard_body).await {
                    ::core::result::Result::Ok(result) => result,
                    ::core::result::Result::Err(reason) => #from_lock_error(#private::lost(reason)),
                }
            };
            #private::release_logged(__syncguard_guard).await;
            __syncguard_result
        }
    })
}

fn check_signature(item: &ItemFn) -> syn::Result<()> {
    let sig = &item.sig;
    if let Some(constness) = &sig.constness {
        return Err(syn::Error::new(
            constness.span(),
            "`#[locked]` cannot be used on a `const fn`: locking is async I/O",
        ));
    }
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            "`#[locked]` works on `async fn` only: make this function `async`",
        ));
    }
    Ok(())
}

/// The names the function's parameters bind (those written as plain identifiers).
fn parameter_names(item: &ItemFn) -> Vec<String> {
    item.sig
        .inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(ident) => Some(ident.ident.to_string()),
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
        .collect()
}

/// `guard = name` must not shadow a parameter: the body would silently see the guard.
fn check_guard_name(args: &Args, item: &ItemFn) -> syn::Result<()> {
    let Some(guard) = &args.guard else {
        return Ok(());
    };
    let name = guard.to_string();
    if name == "self" || parameter_names(item).contains(&name) {
        return Err(syn::Error::new(
            guard.span(),
            format!(
                "`guard = {name}` would hide the parameter `{name}` of `{}` from the body; choose another name, e.g. `guard = lock`",
                item.sig.ident
            ),
        ));
    }
    Ok(())
}

/// `String::from("...")` or `format!("...{}...", a, self.b.c)` for the key template.
fn key_expression(key: &syn::LitStr, item: &ItemFn) -> syn::Result<TokenStream> {
    let span = key.span();
    let segments =
        template::parse(&key.value()).map_err(|message| syn::Error::new(span, message))?;
    let has_receiver = item.sig.receiver().is_some();
    let params = parameter_names(item);

    let mut format = String::new();
    let mut values = Vec::new();
    for segment in segments {
        match segment {
            Segment::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Segment::Value { root, path } => {
                let known = if root == "self" {
                    has_receiver
                } else {
                    params.contains(&root)
                };
                if !known {
                    let listed = if params.is_empty() {
                        "it has none".to_owned()
                    } else {
                        format!("it has: {}", params.join(", "))
                    };
                    let message = if root == "self" {
                        "`{self...}` in the key needs a method with a `self` receiver".to_owned()
                    } else {
                        format!(
                            "`{{{root}}}` in the key names no parameter of `{}` ({listed})",
                            item.sig.ident
                        )
                    };
                    return Err(syn::Error::new(span, message));
                }
                format.push_str("{}");
                let root = syn::Ident::new(&root, span);
                let fields = path.iter().map(|field| match field.parse::<u32>() {
                    Ok(index) => {
                        let index = syn::Index { index, span };
                        quote_spanned!(span=> .#index)
                    }
                    Err(_) => {
                        let field = format_ident!("{}", field, span = span);
                        quote_spanned!(span=> .#field)
                    }
                });
                values.push(quote_spanned!(span=> &#root #(#fields)*));
            }
        }
    }
    if values.is_empty() {
        return Ok(quote_spanned!(span=> ::std::string::String::from(#format)));
    }
    Ok(quote_spanned!(span=> ::std::format!(#format, #(#values),*)))
}

fn duration(private: &TokenStream, duration: &DurationArg) -> TokenStream {
    // Seconds and nanoseconds apart: any duration humantime parses fits, none wraps.
    let secs = duration.value.as_secs();
    let nanos = duration.value.subsec_nanos();
    quote_spanned!(duration.span=> #private::Duration::new(#secs, #nanos))
}

fn retry_policy(args: &Args, private: &TokenStream) -> TokenStream {
    let mut policy = match &args.wait {
        Some(Wait::Once(span)) => {
            return quote_spanned!(*span=> #private::RetryPolicy::single_attempt());
        }
        Some(Wait::For(wait)) => {
            let wait = duration(private, wait);
            // Waiting for a time means retrying until then, unless `retries` caps it.
            quote!(#private::RetryPolicy::new().with_timeout(#wait).with_max_retries(u32::MAX))
        }
        None => quote!(#private::RetryPolicy::new()),
    };
    if let Some((retries, span)) = &args.retries {
        policy = quote_spanned!(*span=> #policy.with_max_retries(#retries));
    }
    if let Some(delay) = &args.retry_delay {
        let delay = duration(private, delay);
        policy = quote!(#policy.with_base_delay(#delay));
    }
    if let Some(backoff) = &args.backoff {
        let variant = match backoff.value.as_str() {
            "fixed" => quote_spanned!(backoff.span=> Fixed),
            _ => quote_spanned!(backoff.span=> Exponential),
        };
        policy = quote!(#policy.with_backoff(#private::Backoff::#variant));
    }
    if let Some(jitter) = &args.jitter {
        let variant = match jitter.value.as_str() {
            "full" => quote_spanned!(jitter.span=> Full),
            "none" => quote_spanned!(jitter.span=> None),
            _ => quote_spanned!(jitter.span=> Equal),
        };
        policy = quote!(#policy.with_jitter(#private::Jitter::#variant));
    }
    policy
}

fn mentions_impl_trait(output: &ReturnType) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => ident == "impl",
            TokenTree::Group(group) => walk(group.stream()),
            _ => false,
        })
    }
    match output {
        ReturnType::Type(_, ty) => walk(quote!(#ty)) || matches!(**ty, Type::ImplTrait(_)),
        ReturnType::Default => false,
    }
}
