//! Generated protobuf types and gRPC services of the `comas.v1` package.
pub mod v1 {
    tonic::include_proto!("comas.v1");
}
