#define _GNU_SOURCE
#include <sys/mman.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
int main(int c,char**v){size_t n=(size_t)atol(v[1])<<20;int seal=atoi(v[2]);
int fd=memfd_create("x",MFD_ALLOW_SEALING);fallocate(fd,0,0,n);
char*buf=malloc(1<<21);memset(buf,1,1<<21);for(size_t o=0;o<n;o+=1<<21)pwrite(fd,buf,1<<21,o);
void*m=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);
double a=now();munmap(m,n);double b=now();int r=fcntl(fd,F_ADD_SEALS,seal);double c2=now();void*ro=mmap(0,n,PROT_READ,MAP_SHARED,fd,0);double d=now();
printf("munmap %.2f seal(%d)=%d %.2f mmap %.2f\n",b-a,seal,r,c2-b,d-c2);}
