include!("../build-support/libtorch_link.rs");

fn main() {
    emit_libtorch_link_args();
}
