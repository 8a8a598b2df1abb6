#pragma once
#include "core/cl_defs.h"
namespace cl { namespace portable {
CL_HD float expf_(float x){return std::exp(x);} CL_HD double exp_(double x){return std::exp(x);}
CL_HD float logf_(float x){return std::log(x);} CL_HD double log_(double x){return std::log(x);}
CL_HD float sinf_(float x){return std::sin(x);} CL_HD double sin_(double x){return std::sin(x);}
CL_HD float cosf_(float x){return std::cos(x);} CL_HD double cos_(double x){return std::cos(x);}
CL_HD float tanhf_(float x){return std::tanh(x);} CL_HD double tanh_(double x){return std::tanh(x);}
CL_HD float erff_(float x){return std::erf(x);} CL_HD double erf_(double x){return std::erf(x);}
}}
