//! Checkpoints in object storage: `s3://` (and `s3a://`), `gs://`, and
//! `az://` (and `adl://`, `azure://`, `abfs://`, `abfss://`), read by
//! ranged requests through the `object_store` crate (feature
//! `object-store`).
//!
//! The URL is parsed by `object_store` itself, and the store is built
//! from each builder's `from_env()`: the standard variables and
//! credential chains apply (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP`, `AWS_SKIP_SIGNATURE` for public buckets, profiles
//! and instance metadata; `GOOGLE_SERVICE_ACCOUNT`,
//! `GOOGLE_APPLICATION_CREDENTIALS`; `AZURE_STORAGE_ACCOUNT_NAME`,
//! `AZURE_STORAGE_ACCOUNT_KEY`, `AZURE_STORAGE_SAS_KEY`, ...). Requests
//! are signed by `object_store`, never here.
//!
//! Opening makes one `HEAD`: the object's length and its ETag (and
//! version, where the store keeps versions). Every read is then one
//! ranged `GET` conditional on that ETag (`If-Match`) and version, and
//! what comes back is checked before its bytes are used:
//!
//! - an object replaced since it was opened is an error saying it
//!   changed (the store refuses the condition; a store that ignores it is
//!   caught by the ETag and length its answer carries), never other bytes;
//! - the range answered must be the range asked for, and the body exactly
//!   that long (read chunk by chunk, never more than asked is kept);
//! - transient failures are tried again by `object_store`'s own retry,
//!   bounded: at most 3 retries, backing off from 0.25 s, within 60 s;
//!   a request may take 600 s with its body, and fails when its body
//!   stalls for 60 s;
//! - other errors name the URL and what the store said (not found,
//!   forbidden, not authenticated, ...).
//!
//! [`RangeRead`] is blocking; the requests run on one tokio runtime
//! shared by every object read here, made when the first is opened
//! (never one per request). Called from inside another tokio runtime (an
//! async caller), a request is run on a thread of its own so that the
//! caller's runtime is not blocked into a panic; async callers should
//! still call it from `spawn_blocking`.
//!
//! Tested against an S3 server (`s3s-fs`) on loopback. `gs://` and
//! `az://` take the same path through `object_store` and this module, but
//! are not tested here against a real server.

use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::ClientConfigKey;
use object_store::{
    BackoffConfig, GetOptions, GetRange, ObjectStore, ObjectStoreExt, ObjectStoreScheme,
    RetryConfig,
};

use crate::error::{Error, ErrorKind, Result};
use crate::ranged::RangeRead;

/// An object in a bucket, read by ranges.
pub struct BucketFile {
    url: String,
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    len: u64,
    /// The ETag when it was opened: every read is conditional on it.
    e_tag: Option<String>,
    /// The version when it was opened, where the store keeps versions.
    version: Option<String>,
}

impl std::fmt::Debug for BucketFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketFile")
            .field("url", &self.url)
            .field("store", &self.store.to_string())
            .field("len", &self.len)
            .field("e_tag", &self.e_tag)
            .field("version", &self.version)
            .finish()
    }
}

fn io_err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Io, message)
}

/// The runtime every request runs on, made once.
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("ptload-bucket")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| io_err(format!("cannot start the runtime for object storage: {e}")))
}

/// Run `work` to its end on the shared runtime, blocking the caller; from
/// inside another runtime, on a thread of its own.
fn block_on<T: Send>(work: impl std::future::Future<Output = T> + Send) -> Result<T> {
    let runtime = runtime()?;
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(runtime.block_on(work));
    }
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("ptload-bucket-call".into())
            .spawn_scoped(s, || runtime.block_on(work))
            .map_err(|e| io_err(format!("cannot start a thread for object storage: {e}")))?
            .join()
            .map_err(|_| io_err("a request to object storage failed on its thread"))
    })
}

/// The retries of every request: bounded in count and in time.
fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(4),
            base: 2.0,
        },
        max_retries: 3,
        retry_timeout: Duration::from_secs(60),
    }
}

/// How long one request may take, its body included: a storage is one
/// request, up to 64 MiB or the size of the largest storage (object_store's
/// default, 30 s, fails a large storage on a slow link every time).
const BODY_TIMEOUT: &str = "600s";

/// How long a body may stall without a byte before the request fails (and
/// is tried again).
const STALL_TIMEOUT: &str = "60s";

/// `url`'s store (built from the environment) and the object's path in it.
fn store_for(url: &str) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    // The store's HTTP client takes rustls' process-wide crypto provider:
    // ring, unless the program installed another first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let parsed = url::Url::parse(url).map_err(|e| io_err(format!("{url}: not a URL: {e}")))?;
    let (scheme, path) = ObjectStoreScheme::parse(&parsed)
        .map_err(|e| io_err(format!("{url}: not an object storage URL: {e}")))?;
    if path.as_ref().is_empty() {
        return Err(io_err(format!(
            "{url}: names a bucket, not an object in it"
        )));
    }
    let built = |e: object_store::Error| io_err(format!("{url}: {e}"));
    let store: Arc<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::AmazonS3 => Arc::new(
            object_store::aws::AmazonS3Builder::from_env()
                .with_url(url)
                .with_retry(retry())
                .with_config(
                    object_store::aws::AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                    BODY_TIMEOUT,
                )
                .with_config(
                    object_store::aws::AmazonS3ConfigKey::Client(ClientConfigKey::ReadTimeout),
                    STALL_TIMEOUT,
                )
                .build()
                .map_err(built)?,
        ),
        ObjectStoreScheme::GoogleCloudStorage => Arc::new(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .with_retry(retry())
                .with_config(
                    object_store::gcp::GoogleConfigKey::Client(ClientConfigKey::Timeout),
                    BODY_TIMEOUT,
                )
                .with_config(
                    object_store::gcp::GoogleConfigKey::Client(ClientConfigKey::ReadTimeout),
                    STALL_TIMEOUT,
                )
                .build()
                .map_err(built)?,
        ),
        ObjectStoreScheme::MicrosoftAzure => Arc::new(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .with_retry(retry())
                .with_config(
                    object_store::azure::AzureConfigKey::Client(ClientConfigKey::Timeout),
                    BODY_TIMEOUT,
                )
                .with_config(
                    object_store::azure::AzureConfigKey::Client(ClientConfigKey::ReadTimeout),
                    STALL_TIMEOUT,
                )
                .build()
                .map_err(built)?,
        ),
        _ => {
            return Err(io_err(format!(
                "{url}: not an object storage URL (s3://, gs://, az://)"
            )))
        }
    };
    Ok((store, path))
}

/// What the store said, in words, with the URL.
fn describe(url: &str, what: &str, e: object_store::Error) -> Error {
    use object_store::Error as E;
    let said = match &e {
        E::NotFound { source, .. } => {
            format!("not found (no such object, or no such bucket): {source}")
        }
        E::PermissionDenied { source, .. } => format!("access denied (forbidden): {source}"),
        E::Unauthenticated { source, .. } => {
            format!("not authenticated (check the credentials the environment gives): {source}")
        }
        E::Precondition { .. } => {
            "the object changed since it was opened (its ETag or version no longer matches)"
                .to_owned()
        }
        E::Generic { store, source } => format!("{store} said: {source}"),
        other => other.to_string(),
    };
    io_err(format!("{what} {url}: {said}"))
}

impl BucketFile {
    /// Learn the length, ETag and version of the object at `url` with one
    /// `HEAD`.
    pub fn open(url: &str) -> Result<BucketFile> {
        let (store, path) = store_for(url)?;
        let meta = block_on(store.head(&path))?.map_err(|e| describe(url, "HEAD", e))?;
        Ok(BucketFile {
            url: url.to_owned(),
            store,
            path,
            len: meta.size,
            e_tag: meta.e_tag,
            version: meta.version,
        })
    }

    /// The bytes `range`, exactly, of the object as it was opened.
    async fn get(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let url = &self.url;
        let (start, end) = (range.start, range.end);
        let options = GetOptions {
            if_match: self.e_tag.clone(),
            version: self.version.clone(),
            range: Some(GetRange::Bounded(range.clone())),
            ..GetOptions::default()
        };
        let what = format!("GET bytes {start}-{} of", end - 1);
        let result = self
            .store
            .get_opts(&self.path, options)
            .await
            .map_err(|e| describe(url, &what, e))?;
        // A store that ignores the condition still names what it sent.
        let changed = (self.e_tag.is_some() && result.meta.e_tag != self.e_tag)
            || result.meta.size != self.len;
        if changed {
            return Err(io_err(format!(
                "{what} {url}: the object changed since it was opened ({} bytes, ETag {} at \
                 first; {} bytes, ETag {} now)",
                self.len,
                self.e_tag.as_deref().unwrap_or("none"),
                result.meta.size,
                result.meta.e_tag.as_deref().unwrap_or("none"),
            )));
        }
        if result.range != range {
            return Err(io_err(format!(
                "{what} {url}: the store sent bytes {}-{} instead",
                result.range.start,
                result.range.end.saturating_sub(1)
            )));
        }
        let want = end - start;
        let size = usize::try_from(want).map_err(|_| io_err(format!("{what} {url}: too large")))?;
        let mut body = Vec::new();
        body.try_reserve_exact(size)
            .map_err(|_| io_err(format!("{what} {url}: cannot hold {want} bytes in memory")))?;
        let mut stream = result.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| describe(url, &what, e))?;
            if chunk.len() > size - body.len() {
                return Err(io_err(format!(
                    "{what} {url}: the store sent more than the {want} bytes asked for"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        if body.len() != size {
            return Err(io_err(format!(
                "{what} {url}: asked for {want} bytes, the body held {} (truncated)",
                body.len()
            )));
        }
        Ok(body)
    }
}

impl RangeRead for BucketFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.len)
            .ok_or_else(|| {
                std::io::Error::other(format!(
                    "{}: {len} bytes at {offset} lie past its end ({} bytes)",
                    self.url, self.len
                ))
            })?;
        block_on(self.get(offset..end))
            .and_then(|r| r)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    fn name(&self) -> &str {
        &self.url
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_without_an_object_is_refused_before_any_request() {
        for url in [
            "s3://bucket/",
            "s3://bucket",
            "gs://bucket/",
            "az://container/",
        ] {
            let e = BucketFile::open(url).expect_err(url).to_string();
            assert!(e.contains("names a bucket, not an object"), "{e}");
            assert!(e.contains(url), "{e}");
        }
    }

    #[test]
    fn blocking_from_inside_a_runtime_does_not_panic() {
        // The shared runtime's own thread: a nested block_on would panic.
        let inner = block_on(async { block_on(async { 6 * 7 }) });
        assert_eq!(inner.unwrap().unwrap(), 42);
        // Another runtime's.
        let other = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got = other.block_on(async { block_on(async { 1 + 1 }) });
        assert_eq!(got.unwrap(), 2);
    }
}
