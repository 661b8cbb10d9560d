//! A command's output must not be one of its inputs: the output is written whole (often
//! atomically, by rename), so the input it was read from would be gone.
use anyhow::{bail, Result};
use std::path::Path;

/// Refuses `out` (given as `flag`) when it names one of `inputs`, under any spelling.
pub fn not_an_input(flag: &str, out: &Path, inputs: &[&Path]) -> Result<()> {
    if let Some(input) = inputs.iter().find(|i| comas_files::same_file(out, i)) {
        bail!(
            "{flag} {} is the input {}: the output would replace it; write the output to another file",
            out.display(),
            input.display()
        );
    }
    Ok(())
}
