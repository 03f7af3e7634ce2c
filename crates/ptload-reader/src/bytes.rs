//! A bounds-checked little-endian reader over a byte slice that knows its offset.

use crate::error::{Error, ErrorKind, Result};

#[derive(Debug, Clone)]
pub(crate) struct ByteReader<'a> {
    data: &'a [u8],
    pos: usize,
    kind: ErrorKind,
}

impl<'a> ByteReader<'a> {
    pub(crate) fn new(data: &'a [u8], kind: ErrorKind) -> Self {
        ByteReader { data, pos: 0, kind }
    }

    pub(crate) fn at(data: &'a [u8], pos: usize, kind: ErrorKind) -> Self {
        ByteReader { data, pos, kind }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    #[cold]
    #[inline(never)]
    fn eof(&self, wanted: usize) -> Error {
        Error::end_of_data(
            self.kind,
            format!(
                "unexpected end of data: {wanted} bytes wanted, {} left",
                self.remaining()
            ),
        )
        .at(self.pos as u64)
    }

    #[inline]
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let found = self
            .pos
            .checked_add(n)
            .and_then(|end| Some((end, self.data.get(self.pos..end)?)));
        match found {
            Some((end, out)) => {
                self.pos = end;
                Ok(out)
            }
            None => Err(self.eof(n)),
        }
    }

    #[inline]
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let at = self.pos;
        let bytes = self.bytes(N)?;
        // `bytes` holds exactly N bytes; the conversion cannot fail.
        bytes.try_into().map_err(|_| {
            self.pos = at;
            self.eof(N)
        })
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Result<u8> {
        match self.data.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.eof(1)),
        }
    }

    #[inline]
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    #[inline]
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    #[inline]
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Bytes up to (not including) the next `\n`, consuming the newline.
    pub(crate) fn line(&mut self) -> Result<&'a [u8]> {
        let rest = self.data.get(self.pos..).ok_or_else(|| self.eof(1))?;
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                let line = self.bytes(n)?;
                self.pos += 1;
                Ok(line)
            }
            None => Err(Error::new(self.kind, "unterminated line").at(self.pos as u64)),
        }
    }
}

/// At most the first `n` bytes of `data`: all of it when it is shorter.
pub(crate) fn head(data: &[u8], n: usize) -> &[u8] {
    data.split_at_checked(n).map_or(data, |(head, _)| head)
}

/// The bytes of `data` from `at` on: none when `at` is past its end.
pub(crate) fn after(data: &[u8], at: usize) -> &[u8] {
    data.split_at_checked(at).map_or(&[], |(_, rest)| rest)
}

/// Where `needle` first starts in `haystack`.
#[cfg(feature = "scan")]
pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Where `word` starts in `text`, each occurrence in turn (overlapping
/// ones too).
#[cfg(feature = "scan")]
pub(crate) fn occurrences<'t>(text: &'t [u8], word: &'t [u8]) -> impl Iterator<Item = usize> + 't {
    let mut from = 0;
    std::iter::from_fn(move || {
        let at = from + find(text.get(from..)?, word)?;
        from = at + 1;
        Some(at)
    })
}

/// `data[start..start + len]` with every bound checked, as a `u64` range.
pub(crate) fn slice(data: &[u8], start: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(start).ok()?;
    let len = usize::try_from(len).ok()?;
    data.get(start..start.checked_add(len)?)
}

/// Byte order of the storages in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ByteOrder {
    /// Little-endian (every file written on x86-64 or Arm).
    #[default]
    Little,
    /// Big-endian: bytes are swapped to host order on access.
    Big,
}

impl ByteOrder {
    /// The byte order of the machine running this code.
    pub const HOST: ByteOrder = if cfg!(target_endian = "big") {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };

    /// `little` or `big`.
    pub fn name(self) -> &'static str {
        match self {
            ByteOrder::Little => "little",
            ByteOrder::Big => "big",
        }
    }

    /// Whether elements of `unit` bytes stored in this order must be
    /// swapped to be read on this machine.
    pub fn needs_swap(self, unit: usize) -> bool {
        self != ByteOrder::HOST && unit > 1
    }

    /// Put `bytes`, elements of `unit` bytes stored in this byte order, in
    /// the host's order, in place: nothing to do when the orders agree or
    /// elements are single bytes. A complex element swaps per component
    /// (`unit` is [`DType::swap_unit`](crate::DType::swap_unit)).
    /// A trailing partial element is left as it is.
    pub fn to_host(self, bytes: &mut [u8], unit: usize) {
        if self.needs_swap(unit) {
            bytes.chunks_exact_mut(unit).for_each(<[u8]>::reverse);
        }
    }
}

/// Negate a little-endian two's complement integer in place.
pub(crate) fn negate_le(bytes: &mut [u8]) {
    let mut carry = 1u16;
    for b in bytes.iter_mut() {
        let v = u16::from(!*b) + carry;
        *b = (v & 0xff) as u8;
        carry = v >> 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_host_swaps_each_unit_only_across_orders() {
        let other = if ByteOrder::HOST == ByteOrder::Little {
            ByteOrder::Big
        } else {
            ByteOrder::Little
        };
        let mut b = [1, 2, 3, 4, 5, 6, 7];
        other.to_host(&mut b, 2);
        assert_eq!(b, [2, 1, 4, 3, 6, 5, 7]);
        ByteOrder::HOST.to_host(&mut b, 2);
        assert_eq!(b, [2, 1, 4, 3, 6, 5, 7]);
        other.to_host(&mut b, 1);
        assert_eq!(b, [2, 1, 4, 3, 6, 5, 7]);
    }

    #[test]
    fn negates_twos_complement() {
        for v in [0i32, 1, -1, 255, -256, i32::MAX, i32::MIN + 1] {
            let mut b = v.to_le_bytes();
            negate_le(&mut b);
            assert_eq!(i32::from_le_bytes(b), -v);
        }
        let mut b = i32::MIN.to_le_bytes();
        negate_le(&mut b);
        assert_eq!(i32::from_le_bytes(b), i32::MIN);
    }
}
