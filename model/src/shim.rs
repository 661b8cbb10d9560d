//! What the C++ shims in `csrc/` (oneDNN's packed linears, the few-row kernel) share: taking a
//! tensor handle back from them, and the rows that make a product a decode step's.
use crate::error::{ModelError, Result};
use std::ffi::{c_char, CStr};
use tch::Tensor;
use torch_sys::C_tensor;

/// Rows up to which a product counts as a decode step's, not a prefill's.
pub const MAX_ROWS: i64 = 64;

/// Takes ownership of a tensor handle from a shim in `csrc/`, or its error message.
pub(crate) fn wrap(ptr: *mut C_tensor, error: *mut c_char, what: &str) -> Result<Tensor> {
    if ptr.is_null() {
        return Err(ModelError::Weights(format!("{what}: {}", take_error(error))));
    }
    // SAFETY: the shim returns a fresh `new at::Tensor`, which tch's Tensor owns and deletes.
    Ok(unsafe { Tensor::from_ptr(ptr) })
}

/// The message a shim in `csrc/` left in its `error` out-parameter (malloc'd, freed here).
pub(crate) fn take_error(error: *mut c_char) -> String {
    if error.is_null() {
        return "unknown error".to_string();
    }
    // SAFETY: the shim wrote a NUL-terminated malloc'd string; it is freed once, here.
    let m = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    unsafe { libc::free(error.cast()) };
    m
}

/// A shim's product on `x` [.., in]: `call` gets `x` as [rows, in] and an error slot and returns
/// [rows, out], given back as [.., out].
pub(crate) fn on_rows(
    x: &Tensor,
    out: i64,
    what: &str,
    call: impl FnOnce(*const C_tensor, *mut *mut c_char) -> *mut C_tensor,
) -> Result<Tensor> {
    let mut shape = x.size();
    let x2 = x.reshape([rows(x), -1]);
    let mut error = std::ptr::null_mut();
    let y = wrap(call(x2.as_ptr(), &mut error), error, what)?;
    *shape.last_mut().expect("x has a last dimension") = out;
    Ok(y.reshape(shape))
}

/// Rows of `x` [.., in]: every dimension but the last.
pub(crate) fn rows(x: &Tensor) -> i64 {
    let size = x.size();
    size[..size.len() - 1].iter().product()
}
