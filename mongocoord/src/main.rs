//! The `mongocoord` command-line tool: demo, shell runners, operator views.

fn main() {}
