//! CID throughput (filled in by the publication issue).
fn main() {}
