//! Errors crossing into Python: the package's base exception, and the
//! reader's errors as the exceptions the package raises for their kinds.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::terms;

create_exception!(
    _ptload,
    Error,
    PyException,
    "Base of every error ptload raises: the reader's message, with `kind`, `offset`, `record` and `tensor` attributes."
);

/// The reader's error as the exception the package raises for its kind:
/// `ptload._errors.from_reader` holds the one table of kinds to Python
/// classes (each a `ptload.Error` and the exception torch raises).
pub(crate) fn to_py(err: ptload_reader::Error) -> PyErr {
    Python::with_gil(|py| {
        let kind = err.kind().name();
        let hint = err.hint().map(|h| h.clause(&terms::Kwargs));
        let made = py.import("ptload._errors").and_then(|m| {
            let extra = pyo3::types::PyDict::new(py);
            extra.set_item("file", err.file())?;
            extra.set_item("hint", hint)?;
            m.getattr("from_reader")?.call(
                (
                    kind,
                    err.render(&terms::Kwargs),
                    err.offset(),
                    err.record(),
                    err.tensor(),
                ),
                Some(&extra),
            )
        });
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        }
    })
}
