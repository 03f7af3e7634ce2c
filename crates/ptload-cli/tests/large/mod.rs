//! A large checkpoint written for the tests that read URLs (remote.rs,
//! bucket.rs): hundreds of megabytes are not committed.

use std::io::Write;
use std::path::Path;

/// A torch zip checkpoint of one float32 tensor `big` of `bytes` bytes
/// (its pickle written here as torch writes it: protocol 2, the storage a
/// persistent id), with a small tensor beside it; the file's size.
pub fn write_large_checkpoint(path: &Path, bytes: u64) -> u64 {
    let numel = bytes / 4;
    let mut pkl: Vec<u8> = vec![0x80, 0x02, b'}', b'q', 0x00, b'('];
    let text = |p: &mut Vec<u8>, s: &str| {
        p.push(b'X');
        p.extend_from_slice(&(s.len() as u32).to_le_bytes());
        p.extend_from_slice(s.as_bytes());
    };
    let int = |p: &mut Vec<u8>, v: u64| {
        p.push(0x8a); // LONG1
        p.push(8);
        p.extend_from_slice(&v.to_le_bytes());
    };
    for (name, key, n) in [("big", "0", numel), ("small", "1", 4)] {
        text(&mut pkl, name);
        pkl.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n(");
        // The persistent id: ('storage', FloatStorage, key, 'cpu', numel).
        pkl.push(b'(');
        text(&mut pkl, "storage");
        pkl.extend_from_slice(b"ctorch\nFloatStorage\n");
        text(&mut pkl, key);
        text(&mut pkl, "cpu");
        int(&mut pkl, n);
        pkl.extend_from_slice(b"tQ");
        int(&mut pkl, 0); // storage offset
        pkl.push(b'(');
        int(&mut pkl, n);
        pkl.push(b't'); // size
        pkl.push(b'(');
        int(&mut pkl, 1);
        pkl.push(b't'); // stride
        pkl.push(0x89); // requires_grad False
        pkl.extend_from_slice(b"ccollections\nOrderedDict\n)R"); // backward hooks
        pkl.extend_from_slice(b"tR");
    }
    pkl.extend_from_slice(b"u.");

    let file = std::fs::File::create(path).unwrap();
    let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(file));
    let stored = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(true)
        .with_alignment(64);
    zip.start_file("large/data.pkl", stored).unwrap();
    zip.write_all(&pkl).unwrap();
    zip.start_file("large/byteorder", stored).unwrap();
    zip.write_all(b"little").unwrap();
    zip.start_file("large/data/0", stored).unwrap();
    let chunk: Vec<u8> = (0..1u32 << 20)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    let mut left = numel * 4;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        zip.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    zip.start_file("large/data/1", stored).unwrap();
    zip.write_all(&[0u8; 16]).unwrap();
    zip.start_file("large/version", stored).unwrap();
    zip.write_all(b"3\n").unwrap();
    zip.finish().unwrap();
    std::fs::metadata(path).unwrap().len()
}
