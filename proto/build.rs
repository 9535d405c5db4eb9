//! Compiles `hanzod/v1/*.proto` with protox (a protobuf compiler in Rust, so building needs
//! no `protoc`) and generates prost messages and tonic services from the descriptors. The
//! encoded descriptor set is kept for gRPC server reflection.

use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] = &[
    "hanzod/v1/common.proto",
    "hanzod/v1/node.proto",
    "hanzod/v1/job.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(PROTOS, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("hanzod_v1_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
