//! Generated protobuf types and gRPC services of the `comas.v1` package, and the weight-stream
//! reassembly both ends of a weight transfer use.
pub mod v1 {
    tonic::include_proto!("comas.v1");
}
/// The `Bytes` type of weight chunk payloads.
pub use prost::bytes;
pub mod weights;
