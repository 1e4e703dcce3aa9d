#pragma once
#include <ATen/core/Tensor.h>

at::Tensor demo_axpy(const at::Tensor& x, const at::Tensor& y, double alpha);
