include!("../build-support/libtorch_link.rs");

/// Compiles `csrc/onednn_linear.cpp` against the headers of the libtorch that torch-sys links.
fn compile_shim() {
    println!("cargo:rerun-if-changed=csrc/onednn_linear.cpp");
    let lib = std::path::PathBuf::from(std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB"));
    let include = lib.parent().expect("libtorch's lib folder has a parent").join("include");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file("csrc/onednn_linear.cpp")
        .compile("comas_onednn");
}

fn main() {
    emit_libtorch_link_args();
    compile_shim();
}
