fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc, so building needs no system protobuf compiler.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let protos = [
        "proto/comas/v1/generation.proto",
        "proto/comas/v1/learner.proto",
        "proto/comas/v1/worker.proto",
        "proto/comas/v1/coordinator.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    // Weight chunk payloads as `Bytes`: a learner slices its published tensors without copying
    // and a relaying worker forwards what it received without copying either.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .bytes(".comas.v1.WeightChunk.data")
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
