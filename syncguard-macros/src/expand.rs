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
    let ret = return_type(&item)?.clone();
    check_guard_name(&args, &item)?;
    let krate = args
        .krate
        .clone()
        .map_or_else(|| quote!(::syncguard), |path| quote!(#path));
    // What the generated code needs beside the public API: two traits.
    let support = quote!(#krate::macro_support);

    let key = args.key.as_ref().ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `key`: name the lock, e.g. `#[locked(key = \"job:{id}\")]`",
        )
    })?;
    let key_expr = key_expression(key, &item)?;
    let options = options(&args, &krate);

    let ret_span = ret.span();
    let nameable_ret = !mentions_impl_trait(&ret);
    let from_lock_error =
        quote_spanned!(ret_span=> <#ret as #support::LockedResult>::from_lock_error);

    // A reference to the backend, of a type `acquire` takes.
    let backend = match &args.backend {
        Some(expr) => quote_spanned! {expr.span()=>
            // `&` extends the life of a temporary (`backend = MemoryBackend::new()`).
            let __syncguard_backend = &(#expr);
            let __syncguard_backend = {
                use #support::BackendArg as _;
                (*__syncguard_backend).as_lock_backend()
            };
        },
        None => quote! {
            let __syncguard_backend = &match #krate::default_backend() {
                ::core::result::Result::Ok(backend) => backend,
                ::core::result::Result::Err(error) => return #from_lock_error(error),
            };
        },
    };
    // One attempt that skips the run when the lock is held, or a wait as the options say.
    let acquire = if args.skips_if_held() {
        let skipped = quote_spanned!(ret_span=> <#ret as #support::SkippedResult>::skipped());
        quote! {
            let __syncguard_guard =
                match #krate::try_acquire(__syncguard_backend, &__syncguard_key, &__syncguard_options).await {
                    ::core::result::Result::Ok(::core::option::Option::Some(guard)) => guard,
                    ::core::result::Result::Ok(::core::option::Option::None) => return #skipped,
                    ::core::result::Result::Err(error) => return #from_lock_error(error),
                };
        }
    } else {
        quote! {
            let __syncguard_guard =
                match #krate::acquire(__syncguard_backend, &__syncguard_key, &__syncguard_options).await {
                    ::core::result::Result::Ok(guard) => guard,
                    ::core::result::Result::Err(error) => return #from_lock_error(error),
                };
        }
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
            let __syncguard_key: ::std::string::String = #key_expr;
            let __syncguard_options = match #options {
                ::core::result::Result::Ok(options) => options,
                ::core::result::Result::Err(error) => return #from_lock_error(error),
            };
            #backend
            #acquire
            let __syncguard_result = {
                #guard_binding
                let __syncguard_body = async move {
                    #pin_return_type
                    #(#stmts)*
                };
                match __syncguard_guard.run(__syncguard_body).await {
                    ::core::result::Result::Ok(result) => result,
                    ::core::result::Result::Err(error) => #from_lock_error(error),
                }
            };
            __syncguard_guard.release_in_background().await;
            __syncguard_result
        }
    })
}

/// `LockOptions::builder()` with the arguments given, then `.build()`: the defaults of
/// `LockOptions` are those of `#[locked]`.
fn options(args: &Args, krate: &TokenStream) -> TokenStream {
    let ttl = args.ttl.as_ref().map(|ttl| {
        let ttl = duration(ttl);
        quote!(.ttl(#ttl))
    });
    let retry = retry_policy(args, krate).map(|retry| quote!(.retry(#retry)));
    let heartbeat = args.heartbeat.as_ref().map(|h| quote!(.heartbeat(#h)));
    let max_hold = args.max_hold.as_ref().map(|d| {
        let d = duration(d);
        quote!(.max_hold(#d))
    });
    let min_hold = args.min_hold.as_ref().map(|d| {
        let d = duration(d);
        quote!(.min_hold(#d))
    });
    let on_lost = args.on_lost.as_ref().map(|choice| {
        let variant = match choice.value.as_str() {
            "notify" => quote_spanned!(choice.span=> Notify),
            _ => quote_spanned!(choice.span=> Cancel),
        };
        quote!(.on_lost(#krate::OnLost::#variant))
    });
    let show_key = args.show_key.as_ref().map(|s| quote!(.show_key(#s)));
    quote! {
        #krate::LockOptions::builder()
            #ttl
            #retry
            #heartbeat
            #max_hold
            #min_hold
            #on_lost
            #show_key
            .build()
    }
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

/// The declared return type, which must be there: lock failures reach the caller through it.
fn return_type(item: &ItemFn) -> syn::Result<&Type> {
    match &item.sig.output {
        ReturnType::Type(_, ty) => Ok(ty),
        ReturnType::Default => Err(syn::Error::new(
            item.sig.paren_token.span.close(),
            format!(
                "`#[locked]` functions must return `Result<T, E>` where `E: From<syncguard::LockError>`, through which lock failures reach the caller; `{}` returns nothing: write e.g. `-> Result<(), syncguard::LockError>`",
                item.sig.ident
            ),
        )),
    }
}

/// The names the function's parameters bind, destructuring patterns included
/// (`(id, name): (u64, String)` binds `id` and `name`).
fn parameter_names(item: &ItemFn) -> Vec<String> {
    let mut names = Vec::new();
    for arg in &item.sig.inputs {
        if let FnArg::Typed(typed) = arg {
            bindings(&typed.pat, &mut names);
        }
    }
    names
}

fn bindings(pat: &Pat, names: &mut Vec<String>) {
    match pat {
        Pat::Ident(ident) => {
            names.push(ident.ident.to_string());
            if let Some((_, sub)) = &ident.subpat {
                bindings(sub, names);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| bindings(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| bindings(p, names)),
        Pat::Struct(fields) => fields.fields.iter().for_each(|f| bindings(&f.pat, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| bindings(p, names)),
        Pat::Reference(reference) => bindings(&reference.pat, names),
        Pat::Paren(paren) => bindings(&paren.pat, names),
        Pat::Type(typed) => bindings(&typed.pat, names),
        // Every alternative binds the same names.
        Pat::Or(or) => {
            if let Some(first) = or.cases.first() {
                bindings(first, names);
            }
        }
        _ => {}
    }
}

/// `guard = name` must not shadow a parameter: the body would silently see the guard.
fn check_guard_name(args: &Args, item: &ItemFn) -> syn::Result<()> {
    let Some(guard) = &args.guard else {
        return Ok(());
    };
    let name = guard.to_string();
    let parameters = parameter_names(item);
    if name == "self" || parameters.contains(&name) {
        // Suggest a name that is free, not one the function already uses.
        let free = ["lock", "guard", "held"]
            .into_iter()
            .map(String::from)
            .chain((2..).map(|n| format!("lock{n}")))
            .find(|candidate| !parameters.contains(candidate))
            .expect("a function has finitely many parameters");
        return Err(syn::Error::new(
            guard.span(),
            format!(
                "`guard = {name}` would hide the parameter `{name}` of `{}` from the body; choose another name, e.g. `guard = {free}`",
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

fn duration(duration: &DurationArg) -> TokenStream {
    // Seconds and nanoseconds apart: any duration humantime parses fits, none wraps.
    let secs = duration.value.as_secs();
    let nanos = duration.value.subsec_nanos();
    quote_spanned!(duration.span=> ::core::time::Duration::new(#secs, #nanos))
}

/// The retry policy the arguments ask for; `None` for the default.
fn retry_policy(args: &Args, krate: &TokenStream) -> Option<TokenStream> {
    let mut policy = match &args.wait {
        Some(Wait::Once(span)) => {
            return Some(quote_spanned!(*span=> #krate::RetryPolicy::single_attempt()));
        }
        // Waiting for a time means retrying until then, unless `retries` caps it.
        Some(Wait::For(wait)) => {
            let wait = duration(wait);
            quote!(#krate::RetryPolicy::wait_for(#wait))
        }
        None => quote!(#krate::RetryPolicy::new()),
    };
    let mut changed = args.wait.is_some();
    if let Some((retries, span)) = &args.retries {
        policy = quote_spanned!(*span=> #policy.with_max_retries(#retries));
        changed = true;
    }
    if let Some(delay) = &args.retry_delay {
        let delay = duration(delay);
        policy = quote!(#policy.with_base_delay(#delay));
        changed = true;
    }
    if let Some(backoff) = &args.backoff {
        let variant = match backoff.value.as_str() {
            "fixed" => quote_spanned!(backoff.span=> Fixed),
            _ => quote_spanned!(backoff.span=> Exponential),
        };
        policy = quote!(#policy.with_backoff(#krate::Backoff::#variant));
        changed = true;
    }
    if let Some(jitter) = &args.jitter {
        let variant = match jitter.value.as_str() {
            "full" => quote_spanned!(jitter.span=> Full),
            "none" => quote_spanned!(jitter.span=> None),
            _ => quote_spanned!(jitter.span=> Equal),
        };
        policy = quote!(#policy.with_jitter(#krate::Jitter::#variant));
        changed = true;
    }
    if let Some(wake) = &args.wake_on_release {
        policy = quote!(#policy.with_wake_on_release(#wake));
        changed = true;
    }
    changed.then_some(policy)
}

fn mentions_impl_trait(ty: &Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => ident == "impl",
            TokenTree::Group(group) => walk(group.stream()),
            _ => false,
        })
    }
    walk(quote!(#ty)) || matches!(ty, Type::ImplTrait(_))
}
