//! numpy values inside torch checkpoints: scalars from their dtype and raw
//! bytes (arrays stay values with a shape).

use super::*;

impl TorchInterp<'_> {
    pub(super) fn numpy_scalar(&self, heap: &mut Heap, args: &[Value]) -> Result<Value> {
        let (descr, big) = match heap.torch(get(args, 0)) {
            Some(TorchObj::NumpyDtype(d)) => (d.descr.clone(), d.big_endian),
            _ => return self.inert(heap, Value::None, Value::None),
        };
        let Some(raw) = heap.bytes(get(args, 1)).map(<[u8]>::to_vec) else {
            return self.inert(heap, Value::None, Value::None);
        };
        heap.charge_bytes(raw.len() + descr.len())?;
        let value = numpy_value(&descr, big, &raw).unwrap_or(Value::None);
        heap.alloc_torch(TorchObj::NumpyScalar {
            descr,
            big_endian: big,
            raw,
            value,
        })
    }
}

/// A numpy scalar's value from its dtype and raw bytes.
fn numpy_value(descr: &str, big_endian: bool, raw: &[u8]) -> Option<Value> {
    let descr = descr.trim_start_matches(['<', '>', '=', '|']);
    let mut b = raw.to_vec();
    if big_endian {
        b.reverse();
    }
    let kind = descr.chars().next()?;
    let size: usize = descr.get(1..)?.parse().ok()?;
    if b.len() != size {
        return None;
    }
    let mut buf = [0u8; 8];
    let fill = |buf: &mut [u8; 8], b: &[u8]| buf.iter_mut().zip(b).for_each(|(d, s)| *d = *s);
    Some(match (kind, size) {
        ('f', 8) => {
            fill(&mut buf, &b);
            Value::Float(f64::from_le_bytes(buf))
        }
        ('f', 4) => {
            let mut four = [0u8; 4];
            four.iter_mut().zip(&b).for_each(|(d, s)| *d = *s);
            Value::Float(f32::from_le_bytes(four).into())
        }
        ('f', 2) => Value::Float(f64::from(crate::torch::dtype::f16_to_f32(
            u16::from_le_bytes([b.first().copied()?, b.get(1).copied()?]),
        ))),
        ('i', 1 | 2 | 4 | 8) => {
            let negative = b.last().is_some_and(|x| x & 0x80 != 0);
            buf = [if negative { 0xff } else { 0 }; 8];
            fill(&mut buf, &b);
            Value::Int(i64::from_le_bytes(buf))
        }
        ('u', 1 | 2 | 4 | 8) => {
            fill(&mut buf, &b);
            let u = u64::from_le_bytes(buf);
            match i64::try_from(u) {
                Ok(i) => Value::Int(i),
                Err(_) => Value::Float(u as f64),
            }
        }
        ('b', 1) => Value::Bool(b.first().copied()? != 0),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_scalars() {
        assert_eq!(
            numpy_value("f8", false, &0.875f64.to_le_bytes()),
            Some(Value::Float(0.875))
        );
        assert_eq!(
            numpy_value("i4", true, &(-2i32).to_be_bytes()),
            Some(Value::Int(-2))
        );
        assert_eq!(
            numpy_value("f2", false, &[0x00, 0x3c]),
            Some(Value::Float(1.0))
        );
        assert_eq!(numpy_value("b1", false, &[1]), Some(Value::Bool(true)));
        assert_eq!(numpy_value("f8", false, &[0; 4]), None);
    }
}
