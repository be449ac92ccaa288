//! `mongoelector`: being built on `store-trait`; see ARCHITECTURE.md.
