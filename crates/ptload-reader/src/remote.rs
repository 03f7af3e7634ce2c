//! Files at URLs: one reader picked by the URL's scheme, for
//! [`OpenOptions::open_url`](crate::OpenOptions::open_url) and
//! [`scan::scan_url`](crate::scan::scan_url). Which strings are URLs is
//! [`ranged::is_url`](crate::ranged::is_url).

use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::ranged::{scheme_of, RangeRead};

/// The error for a URL whose scheme's feature is not compiled in.
#[cfg_attr(all(feature = "http", feature = "object-store"), allow(dead_code))]
fn not_built(url: &str, feature: &str) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!("{url}: reading this kind of URL needs ptload built with the `{feature}` feature"),
    )
}

/// A reader of the file at `url`, by its scheme: `http(s)://` (feature
/// `http`) or object storage (feature `object-store`). Opening it learns
/// the length (one request).
pub fn open_url(url: &str) -> Result<Arc<dyn RangeRead>> {
    match scheme_of(url).as_deref() {
        Some("http" | "https") => {
            #[cfg(feature = "http")]
            return Ok(Arc::new(crate::http::HttpFile::open(url)?));
            #[cfg(not(feature = "http"))]
            return Err(not_built(url, "http"));
        }
        Some(_) => {
            #[cfg(feature = "object-store")]
            return Ok(Arc::new(crate::bucket::BucketFile::open(url)?));
            #[cfg(not(feature = "object-store"))]
            return Err(not_built(url, "object-store"));
        }
        None => Err(Error::new(
            ErrorKind::Unsupported,
            format!("{url}: not a URL ptload reads (http://, https://, s3://, gs://, az://)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheme_ptload_does_not_read_is_refused() {
        let e = open_url("ftp://h/x.pt").expect_err("ftp");
        assert!(e.to_string().contains("not a URL ptload reads"), "{e}");
        assert!(e.to_string().contains("ftp://h/x.pt"), "{e}");
    }
}
