//! Generated protobuf types of the `comas.v1` package.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/comas.v1.rs"));
}
