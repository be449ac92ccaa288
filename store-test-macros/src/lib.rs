//! `#[suite]`, re-exported as `store_test::suite`: every test of a suite is
//! registered by being written, not by a name added to a list.
//!
//! A suite is an inline module of `async fn name<H: Harness>(h: &H)` test
//! bodies. The attribute keeps the module as it is and adds, beside it, a
//! `macro_rules!` macro that takes `(harness_fn, #[test_attr])` and writes one
//! test per body, each asking `harness_fn` for its harness and skipping when
//! it gets none:
//!
//! ```text
//! #[store_test::suite(agent_suite, crate::suite::tests)]
//! pub(crate) mod tests {
//!     use super::*;
//!     pub(crate) async fn claims_follow_priority<H: Harness>(h: &H) { /* … */ }
//! }
//! // elsewhere: store_test::on_all_backends!(crate::suite::agent_suite, ttl);
//! ```
//!
//! Arguments: the macro's name, then the module's own path from the crate
//! root (`crate::…`, so the generated tests can name the bodies wherever the
//! macro is invoked), then optionally `export`, for a suite that other crates
//! run (the macro is `#[macro_export]`ed; otherwise it is `pub(crate) use`d
//! beside the module). The bodies are the module's `pub`/`pub(crate)` `async
//! fn`s of one argument generic over a `Harness` (`<H: Harness>`); other
//! items (helpers) are left alone.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, Item, ItemMod, Path, Token, TypeParamBound, Visibility};

/// See the [crate docs](crate).
#[proc_macro_attribute]
pub fn suite(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = syn::parse_macro_input!(args as Args);
    let module = syn::parse_macro_input!(item as ItemMod);
    match expand(&args, &module) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

struct Args {
    name: Ident,
    path: Path,
    export: bool,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        input.parse::<Token![,]>()?;
        let path: Path = input.parse()?;
        let mut export = false;
        if input.parse::<Option<Token![,]>>()?.is_some() && !input.is_empty() {
            let flag: Ident = input.parse()?;
            if flag != "export" {
                return Err(syn::Error::new(flag.span(), "expected `export`"));
            }
            export = true;
        }
        Ok(Args { name, path, export })
    }
}

fn expand(args: &Args, module: &ItemMod) -> syn::Result<Tokens> {
    let Some((_, items)) = &module.content else {
        return Err(syn::Error::new_spanned(module, "#[suite] needs an inline module (`mod name { … }`)"));
    };
    let segments: Vec<&Ident> = args.path.segments.iter().map(|s| &s.ident).collect();
    if segments.first().is_none_or(|s| *s != "crate") || segments.last() != Some(&&module.ident) {
        return Err(syn::Error::new_spanned(
            &args.path,
            format!("give this module's path from the crate root: `crate::…::{}`", module.ident),
        ));
    }
    let rest = &segments[1..];
    let tests: Vec<&Ident> = items.iter().filter_map(test_body).collect();
    if tests.is_empty() {
        return Err(syn::Error::new_spanned(&module.ident, "a suite with no `pub async fn` test bodies"));
    }
    let name = &args.name;
    let bodies = quote! { $crate #(:: #rest)* };
    let macro_def = quote! {
        macro_rules! #name {
            ($harness:path, #[$attr:meta]) => {
                #(
                    #[$attr]
                    async fn #tests() {
                        let Some(h) = $harness().await else { return };
                        #bodies :: #tests(&h).await;
                    }
                )*
            };
        }
    };
    let exported = if args.export {
        quote! {
            #[doc(hidden)]
            #[macro_export]
            #macro_def
        }
    } else {
        quote! {
            #macro_def
            #[allow(unused_imports)]
            pub(crate) use #name;
        }
    };
    Ok(quote! {
        #module
        #exported
    })
}

/// The name of `item` when it is a test body: a `pub` or `pub(…)` `async fn`
/// of one argument, generic over a `Harness`.
fn test_body(item: &Item) -> Option<&Ident> {
    let Item::Fn(f) = item else { return None };
    let public = !matches!(f.vis, Visibility::Inherited);
    let on_a_harness = f.sig.generics.type_params().any(|p| {
        p.bounds.iter().any(
            |b| matches!(b, TypeParamBound::Trait(t) if t.path.segments.last().is_some_and(|s| s.ident == "Harness")),
        )
    });
    (public && on_a_harness && f.sig.asyncness.is_some() && f.sig.inputs.len() == 1).then_some(&f.sig.ident)
}
