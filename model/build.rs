include!("../build-support/libtorch_link.rs");

/// Compiles the C++ in `csrc/` (the oneDNN shim, the few-row f32 linear, the decode attention,
/// the foreach AdamW) against the headers of the libtorch that torch-sys links.
fn compile_shim() {
    println!("cargo:rerun-if-changed=csrc/onednn_linear.cpp");
    println!("cargo:rerun-if-changed=csrc/rows_linear.cpp");
    println!("cargo:rerun-if-changed=csrc/decode_attention.cpp");
    println!("cargo:rerun-if-changed=csrc/foreach_adamw.cpp");
    println!("cargo:rerun-if-changed=csrc/shim_error.h");
    let lib = std::path::PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB"),
    );
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
        .flag("-O3")
        // at::parallel_for is OpenMP in libtorch and inline: without this it runs on one thread.
        // torch-sys already links libgomp, which the rpath resolves to libtorch's own copy.
        .flag("-fopenmp")
        .file("csrc/onednn_linear.cpp")
        .file("csrc/rows_linear.cpp")
        .file("csrc/decode_attention.cpp")
        .file("csrc/foreach_adamw.cpp")
        .compile("comas_onednn");
}

fn main() {
    emit_libtorch_link_args();
    compile_shim();
}
